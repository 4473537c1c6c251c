"""The dashboard's static files (``static/``), served at ``/ui`` by app/api/ui.py (docs/dashboard.md)."""
