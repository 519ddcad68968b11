"""Convex L2-regularised linear models: losses, SDCA steps, reference optimum (used by HyFDCA)."""
