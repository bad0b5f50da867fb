"""Shared by every test folder: pytest puts this folder on sys.path for its conftest,
so test modules can ``import support``."""
