"""The Advisor tab's browser code: plain ES modules served by the plugin."""
