"""Downstream evaluation: is an encoder any good, on a user's task, by more than the noise.

``tasks`` reads and checks labelled text, ``encoders`` loads the models and their
untrained twins, ``protocols`` scores them (frozen-feature probe, fine-tuning, baselines),
``statistics`` draws the splits and the error bars, ``evaluate`` runs it all and
``report`` prints the table and writes the JSON.
"""
