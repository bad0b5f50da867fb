"""The run's own cost: what each probe spent of each rank's step (``run.overhead``)."""
