"""Kube-Ferry's compute-cluster scheduler: a pure scheduling core, a trace simulator and a service adapter."""
