"""``python -m src.analyses``: the command of the paper's analysis suite (:mod:`src.studies.suite`)."""
