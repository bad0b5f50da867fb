"""The collective ledger: every collective each rank issued, the first divergence, hangs."""
