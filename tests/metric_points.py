"""The data points an in-memory OpenTelemetry metric reader holds, keyed for tests."""

from __future__ import annotations


def reader_points(reader) -> tuple[dict, dict]:
    """``({(metric name, frozenset(attributes)): value}, {metric name: unit})`` of the
    reader's last collection (an OpenTelemetry ``MetricReader`` with ``get_metrics_data``,
    such as ``InMemoryMetricReader``)."""
    out, units = {}, {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                units[m.name] = m.unit
                for p in m.data.data_points:
                    out[(m.name, frozenset(p.attributes.items()))] = p.value
    return out, units
