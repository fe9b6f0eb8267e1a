"""A process's standing with the swarm: the one channel that follows certificate renewal
(``channel``), the tracker client, registration and heartbeats, joining and renewal, the
revocation watch, artifact announcements, and the upkeep every secured member runs."""
