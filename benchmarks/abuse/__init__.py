"""The parts of ``benchmarks/serve_abuse.py``: requests (:mod:`abuse.bodies`), the serve
process (:mod:`abuse.serve`), the attackers (:mod:`abuse.attacks`, run in their own process
so that their CPU does not slow the measurements) and the acceptance probes
(:mod:`abuse.probes`: ``/healthz`` every second, a healthy job exported with the OTel SDK)."""
