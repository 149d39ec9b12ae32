"""The routes, one router per API: ``libretranslate`` (``/translate``, ``/languages``, ``/detect``),
``v1`` (the native API), ``operations`` (``/health``, ``/metrics``) and ``page`` (``/`` and its static
files)."""
