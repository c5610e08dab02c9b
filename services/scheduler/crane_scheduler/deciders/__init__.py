"""Decider workers: the decision (PreFilter, Filter, Score) for many pods at once, in processes of their own.

One scheduling process decides one pod at a time on one core (~0.5 ms of CPU a decision at 1,000-15,000 nodes,
about half of its CPU per pod). With decider workers, the scheduling process keeps everything that must be one
(the informers, the queue, the node table, assume, Reserve, the binding cycle, leadership) and hands the
decision of the common pod to N worker processes (``--decision-workers``), each holding a replica of the node
table (a ``crane_scheduler.simulate.Simulator`` fed by the scheduling process, ``process``). A worker answers with
a node; the scheduling process then checks that node alone against its own table before assuming it (Omega's
optimistic shared state, with the scheduling process as the one place where capacity is claimed):

- the worker had seen the node's row as it is now (``versions.RowVersions``: no event about that node, no
  assumption or nomination on it since the worker's last applied message), and every Filter that reads other
  nodes was skipped by PreFilter: the node is taken (the worker's Filter answered on exactly this row);
- else the node is filtered alone (as kube's nominated node); if another pod took the room meanwhile, the whole
  decision runs in the scheduling process. So two workers can never claim the same capacity: the table that
  counts it is one.

Which pods go to a worker (``eligible``): those whose decision reads only nodes, placed pods and the plugins'
watched objects, all replicated. Pods with resource claims, volumes that bind, a gang, a nomination, or
resources beyond the node's own go through the whole cycle in the scheduling process, as before (DRA devices,
volumes, NUMA zones and gang members are therefore never assumed on a replica's word). A pod nothing fits on a
worker is decided again in the scheduling process, which runs PostFilter (preemption) and reports.

``pool.DeciderPool`` is the scheduling process's side (the replicas' feed, dispatch, restarts); ``process`` the
worker's loop; ``protocol`` the messages; ``cpus`` the default count from the CPUs the container may use.
"""
