"""MLflow (the mlops layer, the only one that imports it): tracked runs and their tags and metrics, the store and
its lock, secret redaction, the pyfunc models (stacker, panel) and the strict server, promotion."""
