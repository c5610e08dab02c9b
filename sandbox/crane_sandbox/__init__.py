"""The local cluster for tests, benchmarks and ``cranectl sandbox``.

etcd, kube-apiserver, Redis, Prometheus and a simulated node fleet, all on loopback.
"""
