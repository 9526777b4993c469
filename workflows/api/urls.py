
from workflows.api.views import (
    McpServerViewSet,
    McpToolViewSet,
    UserServerConfigViewSet,
    VersionActivationViewSet,
    WorkflowInvocationViewSet,
    WorkflowVersionViewSet,
    WorkflowViewSet,
)
from workspaces.api.routers import ApiRouter

router = ApiRouter()
router.register("workflows", WorkflowViewSet, basename="workflow")
router.register("workflow-versions", WorkflowVersionViewSet, basename="workflow-version")
router.register("workflow-activations", VersionActivationViewSet, basename="workflow-activation")
router.register("workflow-invocations", WorkflowInvocationViewSet, basename="workflow-invocation")
router.register("mcp/servers", McpServerViewSet, basename="mcp-server")
router.register("mcp/tools", McpToolViewSet, basename="mcp-tool")
router.register("mcp/configs", UserServerConfigViewSet, basename="mcp-config")

urlpatterns = router.urls
