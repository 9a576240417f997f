"""Kernels as Kubernetes pods: the pod a kernel start creates, what the cluster says about it, and
the program that runs inside it.

The cluster and its GPU-sharing scheduler (HAMi or alike) decide where a pod kernel runs and give
it its slice as extended resources; nothing here schedules. Layers, one way:
``provisioning/pod.py`` (the kernel provisioner) and ``holders/pod.py`` use :mod:`.manifest`
(what to create), :mod:`.cluster` (the Kubernetes API, never on the event loop) and
:mod:`.phases` (a pod's state in words); :mod:`.agent` runs in the pod and needs none of them.
"""
