"""Form fields every app's admin forms share."""

from django import forms
from django.forms.fields import InvalidJSONInput


class JSONTextField(forms.JSONField):
    """JSON typed into a form; nesting deeper than the decoder's stack is refused as invalid JSON is (Django's
    field lets the RecursionError through, a server error), and shown again as typed."""

    def to_python(self, value):
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError("Not JSON this form reads: nested too deeply.", code="invalid") from None

    def bound_data(self, data, initial):
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)
