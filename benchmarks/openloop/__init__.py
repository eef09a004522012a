"""The open-loop benchmark (``make bench-open-loop``): arrivals on a schedule that does not wait for answers, latency
from each request's intended send time. See ``benchmarks/openloop/__main__.py``."""
