"""The API's routes, one APIRouter per area; :mod:`vitrine.web.app` mounts each under ``/v1``
and at its old unversioned path."""

from vitrine.web.routes import admin, events, ops, products, search, suggest

ROUTERS = (search.router, suggest.router, products.router, events.router, ops.router, admin.router)

from vitrine.web.routes import rules  # noqa: E402 - merchandising rules (vitrine/web/routes/rules.py)

ROUTERS = (*ROUTERS, rules.router)

from vitrine.web.routes import analytics  # noqa: E402 - merchant analytics (vitrine/web/routes/analytics.py)

ROUTERS = (*ROUTERS, analytics.router)

from vitrine.web.routes import experiments  # noqa: E402 - A/B experiments (vitrine/web/routes/experiments.py)

ROUTERS = (*ROUTERS, experiments.router)
