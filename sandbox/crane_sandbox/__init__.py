"""The local cluster (etcd, kube-apiserver, Redis, Prometheus, a simulated node fleet) for tests, benchmarks and `cranectl sandbox`."""
