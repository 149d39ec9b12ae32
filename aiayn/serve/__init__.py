"""``aiayn serve``: models behind an HTTP API (FastAPI + uvicorn, the ``serve`` extra).

``settings`` (every limit, validated) -> ``services`` (a loaded model and what it can do:
translate, generate, classify, fill masks) -> ``jobs`` (the kinds of work, each naming its model and
options) -> ``batcher`` (concurrent jobs of one kind decoded together by a worker thread, behind a
bounded queue) -> ``server`` (the models, the batcher and the limits the routes share) ->
``dependencies`` (body limit, API key, validation) and ``schemas`` (the bodies and answers) ->
``routers`` (LibreTranslate's API, the native ``/v1`` API, health and metrics, the page) -> ``app``
(``create_app``). ``aiayn.cli.serve`` starts uvicorn.
"""
