"""The Milvus server itself: restart and reconnect times, idle CPU and collection load time."""
