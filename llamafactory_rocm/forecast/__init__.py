"""The forecast of a run's work, time and cost (docs/forecast.md): optimizer steps and tokens from LLaMA-Factory's
own data pipeline and transformers' own step arithmetic (work.py, tokens.py), time and cost from a card's peak and
a published achieved fraction, each with its source (time.py). Pure functions; imports point down (lf/, machine/)."""
