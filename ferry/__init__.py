"""Kube-Ferry: share one GPU compute cluster among many Kubernetes tenant clusters."""

__version__ = "0.1.0"
