"""Coverage-guided fuzz targets (atheris): run one as a script, see docs/fuzzing.md."""
