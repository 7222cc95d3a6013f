"""The one exception every user-facing input error is raised as."""


class ConfigError(ValueError):
    """A configuration or input problem, phrased for the user (file, field path, allowed values).

    The CLI prints it as one line and exits with status 2."""
