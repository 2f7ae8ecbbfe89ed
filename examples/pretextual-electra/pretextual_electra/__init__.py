"""ELECTRA's replaced-token detection for pretextual; the objective lives in ``pretextual_electra.rtd``."""
