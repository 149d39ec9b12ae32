"""``aiayn serve``: models behind an HTTP API (FastAPI + uvicorn, the ``serve`` extra).

``settings`` (every limit, validated) -> ``services`` (a loaded model and what it can do:
translate, generate, classify, fill masks) -> ``batcher`` (concurrent requests decoded together
by one worker thread, behind a bounded queue) -> ``app`` (the routes: LibreTranslate's API, the
native ``/v1`` API, health, metrics, the page). ``aiayn.cli.serve`` starts uvicorn.
"""
