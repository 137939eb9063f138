"""The API's routes, one APIRouter per area; :mod:`vitrine.web.app` mounts each under ``/v1``
and at its old unversioned path."""

from vitrine.web.routes import admin, ops, products, search, suggest

ROUTERS = (search.router, suggest.router, products.router, ops.router, admin.router)
