"""Create the operator's superuser once and print the login.

The generated password is written to a file (mode 600) so later runs can print it again;
an existing user is never modified.
"""

import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin superuser if missing and print its login."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password-file", default=str(settings.DATA_DIR / "admin-password"))

    def handle(self, *args, username, password_file, **options):
        User = get_user_model()
        path = Path(password_file)
        if User.objects.filter(username=username).exists():
            password = path.read_text().strip() if path.exists() else "(unchanged; set with `manage.py changepassword`)"
            self.stdout.write(f"Admin login: {username} / {password}")
            return
        password = secrets.token_urlsafe(12)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(password + "\n")
        path.chmod(0o600)
        User.objects.create_superuser(username=username, email=f"{username}@localhost", password=password)
        self.stdout.write(self.style.SUCCESS(f"Created admin login: {username} / {password} (kept in {path})"))
