"""profparse's version, in a module of its own: modules below the API (the cache key, output markers, the
report) read it without importing the package's top, which imports the API lazily (no import cycle)."""

__version__ = "0.1.0"
