"""Development tools of the repository, run from its root; not part of the installed package."""
