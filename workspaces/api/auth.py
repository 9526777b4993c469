"""API tokens: exchanged for a username and password, stored only as hashes, expiring, revocable."""

from drf_spectacular.utils import extend_schema, inline_serializer
from knox.views import LoginView, LogoutAllView, LogoutView
from rest_framework import serializers
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.permissions import AllowAny

from workspaces.api.throttles import LoginRateThrottle


class TokenLoginView(LoginView):
    """POST username and password; answers a new token (shown once) and its expiry."""

    authentication_classes = ()
    permission_classes = (AllowAny,)
    throttle_classes = (LoginRateThrottle,)  # per address, whatever the password's outcome

    @extend_schema(
        request=AuthTokenSerializer,
        responses=inline_serializer("ApiToken", {"token": serializers.CharField(),
                                                 "expiry": serializers.DateTimeField()}),
        summary="Exchange a username and password for an API token",
    )
    def post(self, request, format=None):
        serializer = AuthTokenSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        request.user = serializer.validated_data["user"]
        return super().post(request, format=format)


@extend_schema(request=None, responses={204: None}, summary="Revoke the token used for this request")
class TokenLogoutView(LogoutView):
    pass


@extend_schema(request=None, responses={204: None}, summary="Revoke every token of the caller")
class TokenLogoutAllView(LogoutAllView):
    pass
