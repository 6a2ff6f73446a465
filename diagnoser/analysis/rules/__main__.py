"""`python -m diagnoser.analysis.rules > docs/classes.md`"""

from diagnoser.analysis.rules import classes_markdown

print(classes_markdown(), end="")
