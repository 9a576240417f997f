"""Kernels as Kubernetes pods: the pod a kernel start creates and what the cluster says about it.

The cluster and its GPU-sharing scheduler (HAMi or alike) decide where a pod kernel runs and give
it its slice as extended resources; nothing here schedules. Layers, one way:
``provisioning/pod.py`` (the kernel provisioner) and ``holders/pod.py`` use :mod:`.manifest`
(what to create), :mod:`.cluster` (the Kubernetes API, never on the event loop) and
:mod:`.phases` (a pod's state in words). The program that runs in the pod is
:mod:`jupyter_vgpu.pod_agent`, at the top of the package with the other programs (it uses the
holders and the local provisioner, which use this package).
"""
