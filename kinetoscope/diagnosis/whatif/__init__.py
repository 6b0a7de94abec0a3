"""What-if analysis: replay a traced job over its synchronisation points, then replay it again
with chosen local work made ideal, and read the verdict off the differences (see ``search``)."""
