"""The Textual layer: the app, its panels and its stylesheet."""
