"""The local cluster for tests, benchmarks and ``python -m crane_sandbox`` (a development tool, not shipped).

etcd, kube-apiserver, kube-controller-manager, KWOK, Redis, Prometheus and a simulated node fleet, all on loopback.
"""
