"""The statistics (the core layer, below every other): the verdict-table contract, κ / bacc / F1 and the paired
cluster bootstrap, the aggregators, φ̄ and the admissibility rule (§3.3), the ladder (§2), the deployment decision,
the prior-shift, drift and rate maths, the one-line error."""
