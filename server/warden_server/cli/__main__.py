from warden_server.cli import main

main()
