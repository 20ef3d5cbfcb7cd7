"""The answer path as small stages, each `stage(job, next) -> outcome` (gateway/pipeline/stage.py)."""
