package objstore

// SetListPage makes List fetch n keys a request, to test pagination.
func SetListPage(s *S3, n int32) { s.listPage = n }
