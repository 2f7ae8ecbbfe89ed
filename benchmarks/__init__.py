"""Side-by-side benchmarks of pretextual against Hugging Face transformers.

Run ``python -m benchmarks`` from the repository root; see benchmarks/run.py.
"""
