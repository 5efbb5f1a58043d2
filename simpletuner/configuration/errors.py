"""The one error type a configuration problem raises: it carries every problem found."""


class ConfigError(ValueError):
    """Raised with all problems at once, each naming the file and the key."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        count = len(self.problems)
        header = f"{count} configuration problem{'s' if count != 1 else ''}:"
        super().__init__("\n".join([header] + [f"  - {p}" for p in self.problems]))
