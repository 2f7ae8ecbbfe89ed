"""Looking at runs: metrics.jsonl reading, loss-curve plots, run comparison, held-out probes
and objective ablations. Plotting needs matplotlib (the ``plot`` extra); nothing else here
needs more than pretextual itself."""
