"""The tenant API's edge, shared by every app's views and schemas:

- errors.py: the domain errors services raise and the one DRF exception handler that answers them in OpenAI's
  error shape (Retry-After and ``x-ratelimit-*`` on a 429); error_pages.py: Django's own 404 and 500 pages for
  the API's paths, in the same shape.
- input.py (request validation with DRF serializers), parsers.py (the JSON body parser: a size limit, no body
  that makes a 500), negotiation.py (views that answer bytes), pagination.py (OpenAI's cursor pages),
  openapi.py (the error object and the headers every app's OpenAPI description shares).
- idempotency.py: ``Idempotency-Key`` on the create endpoints.
- middleware.py (URLs no view could look up) and request_log.py (one log line per request, its ids bound).

Who may use it: the views, schemas and services of every app (a service raises errors.py's domain errors, each
of which carries its HTTP status); settings and urls name the parser, the middleware, the exception handler and
the error pages. Nothing here imports an app."""
