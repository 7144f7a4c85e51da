"""The ways in: the offline Engine, the server's supervisor (launch_server), the router's CLI and the demo."""
