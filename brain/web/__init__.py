"""The web view beside Flower (layer: top, beside brain/cli and brain/gateway; issue 27):
trees, a tree's graph and timeline, live. ``vancetope web`` serves it alone, ``vancetope up``
beside the stack; docs/web.md says what it shows and who may open it."""
