"""What publishes commands: the send_message tool adapter and the command client."""
