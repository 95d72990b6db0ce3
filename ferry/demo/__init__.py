"""``ferry demo``: a scripted scenario on the clusters of ``ferry up`` that shows what Kube-Ferry does."""
