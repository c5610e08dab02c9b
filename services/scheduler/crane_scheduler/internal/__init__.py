"""The scheduler's internals (kube-scheduler's ``pkg/scheduler/internal``): the scheduling queue and the cache
that keeps the node table and the pending pods in step with the API. Plugins never import these."""
