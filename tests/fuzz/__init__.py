"""Fuzzing: hypothesis properties and atheris targets (docs/fuzzing.md)."""
