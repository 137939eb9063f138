"""The API's routes, one APIRouter per area; :mod:`vitrine.web.app` mounts each under ``/v1``
and at its old unversioned path."""

from vitrine.web.routes import admin, analytics, events, experiments, keys, ops, products, rules, search, suggest

ROUTERS = (search.router, suggest.router, products.router, events.router, ops.router, admin.router,
           rules.router,  # merchandising rules
           analytics.router,  # merchant analytics
           experiments.router,  # A/B experiments
           keys.router)  # scoped API keys
