from .short_protocol import main

main()
