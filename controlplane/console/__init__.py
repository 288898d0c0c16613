"""The operators' console inside Django's admin: the dashboards (admin.py, plotted by svg.py from the samples
beat takes, samples.py and models.py, read by selectors.py), the operator roles as groups (roles.py,
``manage.py roles_sync``) and the login form's throttle (login_throttle.py).

Who may use it: nobody imports it; Django loads its admin, and beat runs its task by name. It stands on the top
floor with metrics (contract "Apps are layered") and reads every app below."""
