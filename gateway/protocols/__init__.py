"""One translator per wire protocol and direction, around the internal request types."""
