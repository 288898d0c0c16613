"""The usage and cost ledger: one row per finished shard with its tokens or rows and its cost (models.py, written
by services.py inside the shard's commit), the prices per model, the measured compute time attributed to the rows
(attribution.py, on beat), the ledger's pure arithmetic (rules.py), the tenant's monthly spend cap (spendcap.py),
operators' reads (selectors.py) and the tenant reports in OpenAI's organization usage and costs shapes
(reports.py, views.py).

Who may use it: the batch pipeline writes through services.py and checks spendcap.py; the batch API and the
console read through selectors.py; batches' schema reuses schema.py. The models, attribution, reports and rules
are the app's own (pyproject.toml, contract "Usage's public surface")."""
