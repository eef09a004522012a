"""Tools for the tests, examples and benchmarks (not part of the library; the wheel ships ``async_batcher`` only).

* :mod:`tools.servers`: a server subprocess on 127.0.0.1, started and stopped (or killed) by its owner.
* :mod:`tools.aws`: DynamoDB Local and moto's server, dummy credentials, an API-call counter.
* :mod:`tools.postgres`: a throwaway PostgreSQL cluster.
"""
